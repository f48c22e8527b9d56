"""Agent providers: one module per outside system, behind the protocol in base.py."""
