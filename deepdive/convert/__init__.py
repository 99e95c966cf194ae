"""`deepdive convert`: DeepDive QA rows into slime's prompt rows."""
