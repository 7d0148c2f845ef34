"""Evidence selection, citation numbering and the jinja2 templates that render reports."""
