"""What the commands show: tables, the text and SVG memory maps, JSON, the HTML report, the
support matrix."""
