"""Training data: the synthetic visual-QA task (numpy only) and folder datasets (host side)."""
