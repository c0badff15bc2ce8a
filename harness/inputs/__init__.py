"""What goes into the checks: Hypothesis strategies and named corner cases (strategies), special scale
values and poisoned padding (special_values), and single-code weight steps (mutations). Imports only
reference/: the lowest room of harness/."""
