"""The documentation site against the code: every script has a page in the nav, whose Arguments
table is the script's command line (no argument missing, none stale; where the page says so, each
row with the text of `--help`) and whose metrics table names every metric the script logs, and every
page is in the nav; and every command of a script shown in the README or the docs uses only flags
the script has."""

import ast
import glob
import os
import re
import shlex

import pytest
import yaml
from run_outputs import PPO_TAGS
from running import REPO_ROOT

SCRIPTS = sorted(
    os.path.basename(path)[: -len(".py")] for path in glob.glob(os.path.join(REPO_ROOT, "cleanrl", "*.py"))
)
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


# The PPO scripts log their loss statistics in one loop, `for name, value in stats.items():
# writer.add_scalar(f"losses/{name}", ...)`: these tags, which their short-run tests find in the event files.
LOOPED_LOSS_TAGS = [tag for tag in PPO_TAGS if tag.startswith("losses/") and tag != "losses/explained_variance"]


def logged_tags(script: str) -> list[str]:
    """The tag of every add_scalar call of the script; an f-string tag as its template
    (`charts/local_num_envs/rank_{r}`), which the page names as it is."""
    tags = []
    for node in ast.walk(script_tree(script)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_scalar":
            tag = node.args[0]
            if ast.unparse(tag) == "f'losses/{name}'":
                tags.extend(LOOPED_LOSS_TAGS)
                continue
            if isinstance(tag, ast.JoinedStr):
                tags.append(
                    "".join(
                        part.value if isinstance(part, ast.Constant) else "{" + ast.unparse(part.value) + "}"
                        for part in tag.values
                    )
                )
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


def section_rows(script: str, *headings: str) -> dict[str, str]:
    """{first code span: last cell} of the table rows in the page's `## ` sections whose titles start
    with one of `headings`: `| `--flag` / `--no-flag` | default | meaning |` gives --flag: meaning."""
    rows, inside = {}, False
    for line in page(script).splitlines():
        if line.startswith("## "):
            inside = line[3:].startswith(headings)
        elif inside and line.startswith("| `"):
            rows[line.split("`")[1]] = line.strip().strip("|").split(" | ")[-1].strip()
    return rows


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_arguments_table_of_a_page_is_the_command_line_of_its_script(script):
    flags, rows = cli_flags(script), section_rows(script, "Arguments")
    missing = "\n".join(f"| `{flag}` | ... | {doc} |" for flag, doc in flags.items() if flag not in rows)
    assert not missing, f"docs/{script}.md lacks these arguments; add them to its Arguments table:\n{missing}"
    stale = sorted(set(rows) - set(flags))
    assert not stale, f"docs/{script}.md's Arguments table has rows for arguments the script does not have: {stale}"


@pytest.mark.parametrize("script", [script for script in SCRIPTS if "the same text as `--help`" in page(script)])
def test_a_page_that_says_its_table_is_the_help_text_gives_the_help_text(script):
    def plain(text: str) -> str:
        return " ".join(text.replace("`", "").split())

    rows = section_rows(script, "Arguments")
    differ = [f"{flag}: {doc!r}" for flag, doc in cli_flags(script).items() if plain(rows[flag]) != plain(doc)]
    assert not differ, f"docs/{script}.md's Arguments rows differ from --help:\n" + "\n".join(differ)


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_metrics_table_of_a_page_is_what_its_script_logs(script):
    rows = section_rows(script, "Metrics", "Logged metrics")
    missing = [tag for tag in logged_tags(script) if tag not in rows]
    assert not missing, f"docs/{script}.md lacks these TensorBoard tags in its metrics table: {missing}"
    with open(os.path.join(REPO_ROOT, "cleanrl", f"{script}.py")) as f:
        source = f.read()
    # the rows beyond the TensorBoard tags: media the script uploads to W&B under a key of its own
    stale = [key for key in set(rows) - set(logged_tags(script)) if f'"{key}"' not in source]
    assert not stale, f"docs/{script}.md's metrics table names tags the script does not log: {stale}"


def script_commands(tokens: list[str]):
    """(script, its arguments) of the command lines in a shell line's tokens, also those quoted inside
    another tool's arguments (`run.py --command "python cleanrl/ppo_atari.py ..."`)."""
    for i, token in enumerate(tokens):
        match = re.fullmatch(r".*cleanrl/(\w+)\.py", token)
        if match:
            arguments = []
            for later in tokens[i + 1 :]:
                if later in ("&&", "||", "|", ";", ">", "2>&1"):
                    break
                arguments.append(later)
            yield match.group(1), arguments
            return
        if re.search(r"cleanrl/\w+\.py\s", token):
            yield from script_commands(shlex.split(token))


def documented_commands() -> list[tuple[str, str, str, list[str]]]:
    """(file, shell line, script, arguments) of every script command in the code blocks of the README
    and the docs."""
    found = []
    for path in [os.path.join(REPO_ROOT, "README.md"), *sorted(glob.glob(os.path.join(DOCS, "*.md")))]:
        with open(path) as f:
            blocks = re.findall(r"```(?:bash|sh|console)?\n(.*?)```", f.read(), re.S)
        for block in blocks:
            for line in block.replace("\\\n", " ").splitlines():
                line = line.strip().removeprefix("$ ")
                if "cleanrl/" in line:
                    for script, arguments in script_commands(shlex.split(line, comments=True)):
                        found.append((os.path.relpath(path, REPO_ROOT), line, script, arguments))
    return found


def test_every_command_in_the_docs_uses_flags_its_script_has():
    commands = [command for command in documented_commands() if command[2] in SCRIPTS]
    assert len(commands) > 40, "the commands of the README and the docs are found"
    unknown = []
    for path, line, script, arguments in commands:
        flags = set(cli_flags(script)) | {"--help"}
        for argument in (argument for argument in arguments if argument.startswith("--")):
            name = argument.split("=")[0].replace("_", "-")  # tyro takes --capture_video as --capture-video
            if name not in flags and not (name.startswith("--no-") and "--" + name[len("--no-") :] in flags):
                unknown.append(f"{path}: {name} is not a flag of {script}.py: {line}")
    assert not unknown, "\n".join(unknown)
