"""A run's folder, ``<root>/runs/<name>``: its layout and listing (``layout``), writing its
configuration and provenance (``directory``), reading what it wrote (``records``), and restoring
parameters from its checkpoints (``params``). Every part of theseus that reads or writes a run goes
through here."""
