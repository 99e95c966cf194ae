"""The base library of deepdive-slurm: what every package builds on, servers or not.

The one error tree (errors.py), typed TOML config (typed_config.py) and a service's config file and options (config_options.py), key=value logs with
secrets redacted (logs.py), atomic files (files.py), the injectable clock (clock.py) and
waiting with backoff (waiting.py), secrets read from files (secrets.py), services as child
processes (process.py), the command-line kit (cli.py), and what a word is (text.py).

It is the bottom of the house: it never imports the HTTP servers beside it (serving/,
tool_server/, reward_server/, web.py, http.py, cache.py, metrics.py, the command table
commands.py), the RL side (deepdive/) or the launcher (slurm/), not even by a module name in a
string to import later (tests/test_layering.py checks).
"""
