"""AdaFedSelecKD (federated multi-domain meeting summarization: global/local adapters, entropy-selective KD)."""
