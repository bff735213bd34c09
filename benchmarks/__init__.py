"""Performance benchmarks of theseus (run ``python benchmarks/run_all.py``)."""
