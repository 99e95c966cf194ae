"""`backend = "slime"`: slime's train.py with our hooks, and everything only it needs.

backend.py          the backend the launcher calls (slurm/backends/__init__.py's seam)
config.py           the `[slime.*]` tables of the experiment file
args.py             the experiment -> slime's argument list; the --custom-config-path YAML
checks.py           what is refused (or warned about) before a job is submitted
replay.py           slime's own parsers, rebuilt from flags.json, over the whole argv
model_context.py    the context a model serves, against the episode's budget
memory_estimate.py  a training GPU's memory, estimated before submission
conversion.py       `deepdive convert-checkpoint`: slime's conversion tools as Slurm jobs
sglang_server.py    SGLang serving a checkpoint for `deepdive eval`
flags.json          every flag slime's train.py accepts at the pinned commits
                    (scripts/slime_flags.py writes it)
presets.json        the model presets, from slime's scripts/models (scripts/slime_presets.py)
"""

DATA_PACKAGE = __name__  # where flags.json and presets.json are (slurm/package_data.py)
