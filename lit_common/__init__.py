"""What the model and data packages share: files written whole, and seeds made of several
numbers."""
