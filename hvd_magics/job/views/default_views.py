"""The views a job gets unless its caller gives its own: widgets where the kernel has them, and
the ranks' output as text."""
from __future__ import annotations

from hvd_magics.job.job_state import JobView
from hvd_magics.job.views.text_view import TextView
from hvd_magics.job.views.widgets_view import WidgetView, widgets_available
from hvd_magics.options import VERBOSITY_ALL


def default_views(verbosity: str = VERBOSITY_ALL, show_output: bool = True,
                  background: bool = False) -> list[JobView]:
    """Widgets in a Jupyter kernel with ipywidgets, plus the ranks' output as text; a
    background job shows widgets only when it can (text printed from its thread would land in
    whichever cell runs then)."""
    views: list[JobView] = []
    widgets = widgets_available()
    text = show_output and not (background and widgets)
    if widgets:  # the ranks' output is shown once: as text, or else in the dashboard
        views.append(WidgetView(display_now=background, show_log=not text))
    if text:
        views.append(TextView(verbosity, epoch_lines=not widgets))
    return views
