"""FedSum (federated extractive summarization under data scarcity: BERTSUM, Algorithms 1-3)."""
