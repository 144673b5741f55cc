"""podsrl: reinforcement learning with verifiable rewards built around PODS
(Policy Optimization with Down-Sampling; Xu et al., arXiv 2504.13818)."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``podsrl.train(cfg, reward_funcs=...)``, imported on first use so that ``import
    podsrl`` stays light."""
    if name == "train":
        from podsrl.trainer import train

        return train
    raise AttributeError(f"module 'podsrl' has no attribute {name!r}")
