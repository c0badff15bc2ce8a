"""Adapters to well-known libraries whose quantizers are cross-checked against the reference."""
