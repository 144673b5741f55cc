"""Code that builds the model assets podsrl ships or caches (the ``tiny`` model, the
SmolLM2 conversion). Training never imports it; ``scripts/build_tiny.py`` and a cache miss
of :func:`podsrl.models.smollm2_path` do."""
