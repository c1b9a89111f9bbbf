"""Integrations with host engines (SGLang)."""

__all__: list[str] = []
