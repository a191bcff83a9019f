"""Models: synthetic presets built from configs with random weights, and local tokenizers."""
