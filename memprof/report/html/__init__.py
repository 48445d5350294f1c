"""The HTML report: one self-contained page (memprof.report.html.page), drawn by the static
files beside this module (template.html, style.css, app.js), inlined when it is written."""
from memprof.report.html.page import html_page, to_json

__all__ = ["html_page", "to_json"]
