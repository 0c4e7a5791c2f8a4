"""Two directives of the fedmcmc documentation.

``{public-api} MODULE`` documents every public name of MODULE (its ``__all__``) with autodoc:
classes, functions and submodules, so a name added to the package appears in the reference
without editing the page. With ``:skip-top-level:`` a name that ``fedmcmc`` itself exports is
left to the page documenting ``fedmcmc`` (a line points there), so no object is described twice.

``{generated-figure} FILE`` shows a file the page's own code blocks write (a tutorial's plot).
Figures are not committed: when docs/_generated/<page>/FILE is missing, the build runs the
page's blocks once (docs/run_examples.py) to make it; a block that fails, or a figure the code
does not write, is a build warning (an error under -W).
"""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import types
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)


def _public_names(module):
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith("_")]
    return list(names)


class PublicApi(SphinxDirective):
    required_arguments = 1
    option_spec = {"skip-top-level": directives.flag}

    def run(self):
        module_name = self.arguments[0]
        module = importlib.import_module(module_name)
        top = importlib.import_module("fedmcmc")
        top_level = {id(getattr(top, n)) for n in top.__all__}
        lines = []
        for name in _public_names(module):
            obj = getattr(module, name)
            full = f"{module_name}.{name}"
            if "skip-top-level" in self.options and id(obj) in top_level:
                if isinstance(obj, types.ModuleType):
                    lines += [f"`{full}`: documented in {{py:mod}}`{obj.__name__}`.", ""]
                else:
                    lines += [f"`{full}`: documented as {{py:obj}}`fedmcmc.{name}`.", ""]
                continue
            if isinstance(obj, types.ModuleType):
                rst = [f".. rubric:: {obj.__name__}", "", f".. automodule:: {obj.__name__}",
                       "   :members:"]
            elif inspect.isclass(obj):
                kind = "autoexception" if issubclass(obj, BaseException) else "autoclass"
                rst = [f".. {kind}:: {full}", "   :members:"]
            elif callable(obj):
                rst = [f".. autofunction:: {full}"]
            else:
                rst = [f".. autodata:: {full}"]
            # autodoc writes reStructuredText: parse it as such inside the Markdown page
            lines += ["```{eval-rst}", *rst, "```", ""]
        container = nodes.container()
        self.state.nested_parse(StringList(lines), self.content_offset, container)
        return container.children


class GeneratedFigure(SphinxDirective):
    required_arguments = 1
    option_spec = {"alt": directives.unchanged, "width": directives.unchanged}
    has_content = True

    def run(self):
        docs = Path(self.env.srcdir)
        docname = self.env.docname
        page = Path(self.env.doc2path(docname))
        relative = Path("_generated") / docname / self.arguments[0]
        target = docs / relative
        if not target.exists():
            tried = self.env.temp_data.setdefault("fedmcmc_pages_run", set())
            if docname not in tried:
                tried.add(docname)
                logger.info(f"running the code of {docname} to make its figures")
                done = subprocess.run(
                    [sys.executable, str(docs / "run_examples.py"), str(page)],
                    capture_output=True, text=True,
                )
                if done.returncode != 0:
                    logger.warning(
                        f"the code blocks of {docname} failed:\n{done.stdout}{done.stderr}",
                        location=(docname, self.lineno),
                    )
        if not target.exists():
            logger.warning(
                f"{relative} is not written by the code blocks of {docname}",
                location=(docname, self.lineno),
            )
            return []
        self.env.note_dependency(str(target))
        image = nodes.image(uri="/" + relative.as_posix(), alt=self.options.get("alt", ""))
        if "width" in self.options:
            image["width"] = self.options["width"]
        figure = nodes.figure("", image)
        if self.content:
            caption_parent = nodes.container()
            self.state.nested_parse(self.content, self.content_offset, caption_parent)
            paragraph = caption_parent.children[0] if caption_parent.children else None
            if isinstance(paragraph, nodes.paragraph):
                figure += nodes.caption(paragraph.rawsource, "", *paragraph.children)
        return [figure]


def setup(app):
    app.add_directive("public-api", PublicApi)
    app.add_directive("generated-figure", GeneratedFigure)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
