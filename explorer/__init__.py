"""The trajectory explorer: runs, learner steps, groups and trajectories in the browser.

``reflexdb ui`` serves it beside the MLflow UI (docs/explorer.md). A Starlette app
(:func:`~reflexdb.explorer.app.create_app`) over read-only sessions (:class:`~reflexdb.explorer.data.Explorer`);
pages are Jinja2 templates with no script and no build step.
"""
