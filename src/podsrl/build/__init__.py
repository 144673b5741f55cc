"""Code that builds the model assets podsrl ships or caches (the ``tiny`` model, the
SmolLM2 conversion). Training never imports it; ``scripts/build_tiny.py`` and a cache miss
of :func:`podsrl.models.smollm2_path` do.

- :mod:`~podsrl.build.tiny`: the built-in ``tiny`` model (arithmetic)
- :mod:`~podsrl.build.tiny_chain`: the built-in ``tiny-chain`` model (the reasoning regime's)
- :mod:`~podsrl.build.smollm2`: SmolLM2-135M-Instruct converted from its GGUF file
- :mod:`~podsrl.build.chat_standins`: offline stand-ins for the hub models and datasets TRL's tests load
"""
