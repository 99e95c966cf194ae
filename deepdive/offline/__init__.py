"""The offline world: a fictional knowledge graph, its pages and questions, and demonstrations
of searching it — so runs need no internet and no model can know an answer without searching."""
