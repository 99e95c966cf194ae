"""The reward server: DeepDive's strict binary reward for slime.

A request travels: app.py (HTTP, validation) -> deepdive.protocol's RewardRequest (every
client payload into one) -> evaluator.py (format check, then the judge) -> format_check.py and a judge
(rule_judge.py, openai_judge.py), answered as deepdive.protocol's RewardReply.
"""
