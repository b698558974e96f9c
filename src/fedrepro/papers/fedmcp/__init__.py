"""FedMCP (federated PEFT on GLUE with model-contrastive personalization: dual adapters, CKA)."""
