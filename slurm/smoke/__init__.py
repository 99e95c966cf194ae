"""The GPU acceptance kit (`deepdive smoke`, `make gpu-smoke`; docs/gpu-smoke.md): what must
work on a cluster's GPU nodes, in the training image, before a training job is worth
submitting, checked in order and each step failing loudly with what it checked:

    1 image   the image as a normal user: driver, GPUs Slurm gave = GPUs torch sees, the
              import closure of slime's training path and our hooks, files readable; a
              real search from the node through the experiment's tool server
    2 nccl    NCCL all-reduce on one node's GPUs and across nodes (bus bandwidth, the
              transport in NCCL's log), gloo over the chosen interface
    3 ray     the project's bootstrap on every node: Ray sees each node's GPUs and
              deepdive_node_K, GPU actors with their own runtime envs start
    4 sglang  SGLang with tensor parallelism behind the router: memory release and resume,
              a weight update from tensor
    5 slime   a short slime run of a 0.5B Qwen with our hooks and the offline world, then a
              to-hf / to-megatron round trip of its checkpoint
    6 local   one step of the local backend on the GPU

Each step runs in a child process of its own (a crash or a hang fails that step, named, and
nothing it loaded stays for the next), on this machine or as one Slurm job through the
launcher (submitit, the image's `apptainer exec --nv` python). A step checks something or
fails: no GPU, a module missing, a node that never answered are failures, never "ok".
"""
