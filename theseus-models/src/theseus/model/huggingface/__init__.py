"""Hugging Face checkpoints in and out: ``hf/import`` and ``hf/export`` jobs, and
``training/init_from=hf:<folder or id>``.

Modules: ``family`` (the ``hf/<model_type>`` component kind: ``config.json`` <-> architecture keys and
tensor names, both ways; the built-in families live in their models' folders, e.g.
``theseus.model.models.gpt.hf``, and are found through the registry, never imported here), ``names``
(tensor-map building blocks), ``safetensors_io`` (tensor-by-tensor reader and sharded writer),
``source`` (folders and hub ids), ``convert`` (checked import plans, export plans), ``importer`` /
``exporter`` (the run directory and output folder), ``jobs`` (the CLI jobs). Safetensors only: pickled
``pytorch_model.bin`` files are refused.
"""
