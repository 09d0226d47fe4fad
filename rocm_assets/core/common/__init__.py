"""Names and settings every layer shares, and text and time formatting."""
