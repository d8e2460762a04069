"""Parley: a self-hosted LLM agent that lives in team chat."""
