"""The zoo's networks in PyTorch; importing any module here imports torch."""
