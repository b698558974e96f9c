"""fedrepro: end-to-end reproductions of four federated-learning-for-text papers."""

__version__ = "0.1.0"
