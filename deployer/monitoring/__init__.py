"""The monitoring tier's own Python: what the product shows about the stack (dashboards)."""
