"""memory."""
