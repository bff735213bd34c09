"""What every model family is built from, naming no family: ``architecture`` (presets and the resolved
``Architecture``), ``block`` (``Block``, one layer, and ``LayerCall``, what a layer is called with),
``mixture`` (``MoEBlock``, ``MixtureLM``), ``windows`` (interleaved sliding-window layers), ``transformer``
(``TransformerLM``), ``scan`` (runs of layers under one ``nn.scan``), ``pipeline`` and ``one_f_one_b``
(pipeline-parallel schedules) and ``decoding`` (the KV-cache decode step). The families themselves are
:mod:`theseus.model.models`."""
