"""Opening a trained run: one home for what reads a run folder back.

- :mod:`theseus.model.loading.run`: the model rebuilt from the run's saved configuration, the
  parameters of one checkpoint and its tokenizer (``load_run``, ``LoadedRun``);
- :mod:`theseus.model.loading.adapters`: a LoRA run's checkpoint (adapters only) over the base its
  ``training/init_from`` names, quantized as it is read when ``model/quantize`` asks for it;
- :mod:`theseus.model.loading.chat`: the chat template a run trained with.

Generation, the lm-eval harness, Hugging Face export, fine-tuning, reward models and reinforcement
learning open runs through these modules; they import none of those packages. The package itself
imports nothing, so a light module can take ``chat.TEMPLATE_FILE`` without jax.
"""
