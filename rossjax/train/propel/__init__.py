"""PROPEL: probe rewards, solvers, the label corpus and the generator evaluation."""
