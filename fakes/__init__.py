"""Stand-ins for what costs money or needs the internet or a GPU (SGLang, Serper, a whole
rollout's services), as real HTTP servers: shared by the tests and the benchmarks."""
