"""The message catalog's parts, joined into one CATALOG by feedback/messages.py."""
