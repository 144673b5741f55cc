"""podsrl: reinforcement learning with verifiable rewards built around PODS
(Policy Optimization with Down-Sampling; Xu et al., arXiv 2504.13818)."""

__version__ = "0.1.0"
