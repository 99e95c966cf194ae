"""The tool server: search / click / open for the agent, over pluggable providers.

A request travels: app.py (HTTP, validation) -> tools.py (dispatch, cache, sessions, leakage
filter, deadline) -> a provider module (serper, serpapi, jina, direct, offline) -> services.client.http.
"""
