"""The documentation site against the code: every script has a page in the nav, the page names
every command-line argument of the script and every metric it logs, and every page is in the nav."""

import ast
import glob
import os

import pytest
import yaml

from common import REPO_ROOT

SCRIPTS = sorted(os.path.basename(path)[: -len(".py")] for path in glob.glob(os.path.join(REPO_ROOT, "cleanrl", "*.py")))
DOCS = os.path.join(REPO_ROOT, "docs")


def script_tree(script: str) -> ast.Module:
    with open(os.path.join(REPO_ROOT, "cleanrl", f"{script}.py")) as f:
        return ast.parse(f.read())


def cli_flags(script: str) -> dict[str, str]:
    """{--flag-name: its docstring} for every field of the script's Args that tyro puts on the command
    line (the fields computed at run time are tyro.conf.Suppress)."""
    args = next(node for node in script_tree(script).body if isinstance(node, ast.ClassDef) and node.name == "Args")
    flags = {}
    for i, node in enumerate(args.body):
        if isinstance(node, ast.AnnAssign) and "Suppress" not in ast.unparse(node.annotation):
            docstring = args.body[i + 1].value.value if i + 1 < len(args.body) else ""
            flags["--" + node.target.id.replace("_", "-")] = " ".join(str(docstring).split())
    return flags


def logged_tags(script: str) -> list[str]:
    """The tag of every add_scalar call of the script; an f-string tag as its template
    (`charts/local_num_envs/rank_{r}`), which the page names as it is."""
    tags = []
    for node in ast.walk(script_tree(script)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_scalar":
            tag = node.args[0]
            if isinstance(tag, ast.JoinedStr):
                tags.append("".join(part.value if isinstance(part, ast.Constant) else "{" + ast.unparse(part.value) + "}"
                                    for part in tag.values))
                continue
            assert isinstance(tag, ast.Constant), f"{script}: a tag this check cannot read: {ast.unparse(tag)}"
            tags.append(tag.value)
    return sorted(set(tags))


def page(name: str) -> str:
    with open(os.path.join(DOCS, f"{name}.md")) as f:
        return f.read()


class AnyTagLoader(yaml.SafeLoader):
    """mkdocs.yml may hold `!!python/name:` tags for markdown extensions: read them as plain values."""


AnyTagLoader.add_multi_constructor("", lambda loader, suffix, node: None)


def nav_pages() -> list[str]:
    with open(os.path.join(REPO_ROOT, "mkdocs.yml")) as f:
        config = yaml.load(f, Loader=AnyTagLoader)

    def walk(entries):
        for entry in entries:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            yield from walk(value) if isinstance(value, list) else [value]

    return list(walk(config["nav"]))


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    pages = sorted(os.path.relpath(path, DOCS) for path in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))
    assert sorted(nav_pages()) == pages


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_has_a_page_of_its_name_in_the_nav(script):
    assert f"{script}.md" in nav_pages()


def table_keys(script: str) -> set[str]:
    """The first code span of every table row of the page: `| `--flag` / `--no-flag` | ...` gives --flag."""
    return {line.split("`")[1] for line in page(script).splitlines() if line.startswith("| `")}


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_page_of_a_script_has_a_row_for_every_argument_of_its_command_line(script):
    missing = {flag: doc for flag, doc in cli_flags(script).items() if flag not in table_keys(script)}
    rows = "\n".join(f"| `{flag}` | ... | {doc} |" for flag, doc in missing.items())
    assert not missing, f"docs/{script}.md lacks these arguments; add them to its Arguments table:\n{rows}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_page_of_a_script_has_a_row_for_every_metric_it_logs(script):
    missing = [tag for tag in logged_tags(script) if tag not in table_keys(script)]
    assert not missing, f"docs/{script}.md lacks these TensorBoard tags in its Logged metrics table: {missing}"
