"""The outbound HTTP clients: one pooled client per upstream, and the lean one for in-cluster hops."""
