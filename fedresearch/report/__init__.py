"""The report: sources read and ranked into evidence, written (extractively, or by a model) in the
form of its type, every cited sentence verified, references built from what was cited, saved."""
