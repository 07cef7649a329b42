"""Analysis: formulas, the ideal table, compare, study, critical path, variation, model and hardware."""
