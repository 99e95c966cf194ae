"""The reward server: DeepDive's strict binary reward for slime.

A request travels: app.py (HTTP, validation) -> models.py (both client payloads into one
EvaluationRequest) -> evaluator.py (format check, then the judge) -> format_check.py and a judge
(rule_judge.py, openai_judge.py).
"""
