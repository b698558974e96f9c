"""FedSUMM (personalized FL for Chinese summarization: gradient modulation, differential privacy)."""
