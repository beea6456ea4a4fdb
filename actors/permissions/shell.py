"""A shell command line as the permission rules judge it: every simple command it would
run, every file it would write, and what the parser cannot decide.

The line is parsed by tree-sitter-bash (the grammar editors and GitHub use for bash),
never matched as a string. Each simple command is found wherever it sits: after `;`,
`&&`, `||`, `|`, `&`, inside `$(...)`, backticks, `<(...)`, `>(...)`, subshells,
`{ ...; }`, function bodies, `if`/`while`/`for`/`case`, strings and heredocs. Its
name is what bash would look up (`\\rm`, `'r'm`, `"rm"` and `/bin/rm` all name `rm`).
Wrappers (`sudo`, `env`, `nice`, `timeout`, `xargs`, `exec`, `command`, `builtin`,
`coproc`, ...) are looked through to the command they run; a line with a line
continuation (`r\\<newline>m`) is judged both as the grammar reads it and joined,
as bash reads it; the code given to `eval`,
`bash -c`/`sh -c` and `trap` is parsed in turn when it is written out literally.

What is left `undecided` (the rules make it `ask`, never `allow`): a line that does not
parse; a command name that is an expansion (`$X`, `$(...)`), a glob or a brace, or a
path outside the system's directories (`./ls`: the project's program, not ls); code
built at run time (`eval "$x"`, `bash -c "$x"`, `env -S`, `sh -c` with no code after
it); a shell reading a script or its standard input (`bash x.sh`, `... | sh`,
`source x`); `xargs` running a wrapper, a shell or git, or taking its command's name
from its input (`-I`); `alias`; `git -c`/`--config-env`; a write to an expanded name
(`> "$f"`); a variable exported to a command (`A=1 cmd`, `env A=1`, `export A`) unless
it is one of `_HARMLESS_VARS`, and one set in the shell that changes what runs (`PATH=`,
`LD_PRELOAD=`, `GIT_*=`, ...; `set -a`); nesting deeper than `MAX_DEPTH`. So is what
dash (`/bin/sh`, which runs the line) reads otherwise than the grammar: a control
character, `$'...'`, `[[ ]]`, `(( ))`, a `>` or `<` in `[ ]`, a newline the grammar
reads across inside a command (after a lone `==`, `=~`, `<$`), a `$(` or a backtick
the grammar leaves in a plain word (``${x:-`cmd`}``) or an unparsed heredoc body (`<<-`).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

from actors.permissions.paths import lexical

if TYPE_CHECKING:
    from tree_sitter import Node, Parser

#: How deep `eval`/`bash -c` inside one another is parsed before giving up (`ask`).
MAX_DEPTH = 8

#: Output redirections (a write to the file named after them).
_WRITES = {">", ">>", ">|", "&>", "&>>", ">&"}
#: Files a redirection may write without it being a write to a file of the user's.
_NOT_FILES = re.compile(r"^/dev/(?:null|stdout|stderr|tty|fd/\d+)$")
#: What a command name may hold once unquoted: anything else (a glob, a brace, `~`,
#: `=`) is expanded or looked up in ways the rules do not follow.
_NAME = re.compile(r"^[A-Za-z0-9_./+:@%-]+$")
#: Variables that change which program a command name runs, what a shell runs first,
#: or a command a program runs (git's, a pager, an editor, an interpreter's options):
#: a plain assignment reaches a program when the name is already exported.
_RISKY_VARS = {"PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV",
               "IFS", "SHELLOPTS", "BASHOPTS", "PROMPT_COMMAND", "GCONV_PATH", "HOME",
               "XDG_CONFIG_HOME", "PAGER", "MANPAGER", "EDITOR", "VISUAL", "BROWSER",
               "SSH_ASKPASS", "JAVA_TOOL_OPTIONS", "MAKEFLAGS", "TMPDIR"}
_RISKY_PREFIX = re.compile(r"^(?:LD_|GIT_|PYTHON|NODE_|NPM_CONFIG_|PERL|RUBY|LESS)")
#: Variables that may be exported to a command (`LANG=C ls`, `export TZ=UTC`): only
#: these. A program reads many others (GIT_CONFIG_*, GIT_SSH_COMMAND, PAGER, NODE_OPTIONS,
#: ...) as code to run, and no list of those is ever complete.
_HARMLESS_VARS = {"LANG", "LANGUAGE", "LC_ALL", "LC_COLLATE", "LC_CTYPE", "LC_MESSAGES",
                  "LC_MONETARY", "LC_NUMERIC", "LC_TIME", "TZ", "TERM", "COLUMNS", "LINES",
                  "NO_COLOR", "CLICOLOR", "FORCE_COLOR", "CI"}
_SHELLS = {"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox"}
#: git's options before its subcommand that take the next word as their value.
_GIT_VALUED = {"-C", "--git-dir", "--work-tree", "--namespace", "--super-prefix",
               "--attr-source"}
_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
#: Control characters: the grammar reads \r, \v and \f as blanks (a `#` after one starts
#: a comment to it), a shell as part of a word; the others are no part of a command.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
#: Nodes a newline ends for a shell: the grammar reads some words (a lone `==`, `=~`,
#: `$` before a blank, `<$`) across one, hiding the command after it.
_ONE_LINE = {"command", "command_name", "file_redirect", "simple_expansion",
             "concatenation", "variable_assignment", "declaration_command",
             "test_command"}
_NEWLINE = re.compile(rb"(?<!\\)\n")  # (`\<newline>` is a line continuation)
#: Where a program named by its path (`/usr/bin/ls`) is the command of that name.
_SYSTEM_BIN = ("/usr/bin/", "/bin/", "/usr/sbin/", "/sbin/", "/usr/local/bin/",
               "/usr/local/sbin/")
#: Leaves whose text the grammar did not read further, though a shell may expand it.
_UNPARSED = {"word", "string_content", "heredoc_body", "heredoc_content", "regex",
             "extglob_pattern"}


@dataclass(frozen=True, slots=True)
class Wrapper:
    """A command that runs the command after its options: the options that take a
    value (`-u USER`), and how many plain words come before the command (`timeout`'s
    duration)."""

    with_value: frozenset[str] = frozenset()
    leading: int = 0
    assignments: bool = False  # `env A=1 cmd`, `sudo A=1 cmd`
    judged_itself: bool = False  # `sudo rm` is judged as `sudo rm` too


WRAPPERS: dict[str, Wrapper] = {
    "command": Wrapper(), "builtin": Wrapper(), "nohup": Wrapper(), "time": Wrapper(),
    "coproc": Wrapper(),  # (the grammar knows no `coproc` keyword: it is a command here)
    "exec": Wrapper(frozenset({"-a"})),
    "nice": Wrapper(frozenset({"-n", "--adjustment"})),
    "timeout": Wrapper(frozenset({"-s", "--signal", "-k", "--kill-after"}), leading=1),
    "env": Wrapper(frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string",
                              "-a", "--argv0"}), assignments=True),
    "stdbuf": Wrapper(frozenset({"-i", "-o", "-e", "--input", "--output", "--error"})),
    "setsid": Wrapper(), "ionice": Wrapper(frozenset({"-c", "-n", "-p", "-P", "-u"})),
    "xargs": Wrapper(frozenset({"-a", "-d", "-E", "-I", "-L", "-n", "-P", "-s",
                                "--arg-file", "--delimiter", "--max-args", "--max-lines",
                                "--max-procs", "--max-chars", "--process-slot-var"})),
    "sudo": Wrapper(frozenset({"-u", "-g", "-h", "-p", "-C", "-D", "-r", "-t", "-U", "-T",
                               "-R", "--user", "--group", "--host", "--prompt", "--chdir",
                               "--chroot", "--role", "--type", "--close-from",
                               "--other-user", "--command-timeout"}),
                    assignments=True, judged_itself=True),
    "doas": Wrapper(frozenset({"-u", "-C"}), judged_itself=True),
}


@dataclass(frozen=True, slots=True)
class Command:
    """One simple command: its `name` (what bash looks up) and `text`, the name and its
    arguments unquoted, joined by one space, what a `shell(GLOB)` rule is matched on."""

    name: str
    text: str


@dataclass(slots=True)
class Parsed:
    """A command line taken apart: its simple commands, the files it writes (absolute,
    lexically normalised), and why parts of it cannot be judged."""

    commands: list[Command] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    undecided: list[str] = field(default_factory=list)


@cache
def _parser() -> Parser:
    import tree_sitter_bash
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_bash.language()))


def parse(line: str, cwd: str = "") -> Parsed:
    """Every simple command, write and undecidable part of `line` (paths against `cwd`)."""
    out = Parsed()
    if _CONTROL.search(line):
        out.undecided.append("a control character (\\r, \\v, \\f, ...), a blank to the "
                             "parser and none to the shell")
    walk = _Walk(out, cwd)
    walk.line(line, 0)
    if "\\\n" in line:
        # bash joins `r\<newline>m` into `rm` before it reads words; the grammar splits
        # it. Judged both ways (outside quotes bash's reading is the joined one).
        walk.line(line.replace("\\\n", ""), 0)
    return out


class _Walk:
    def __init__(self, out: Parsed, cwd: str) -> None:
        self.out, self.cwd = out, cwd

    def line(self, line: str, depth: int) -> None:
        if depth > MAX_DEPTH:
            self.out.undecided.append("code nested deeper than the parser follows")
            return
        root = _parser().parse(line.encode("utf-8", "surrogatepass")).root_node
        if root.has_error:
            self.out.undecided.append("the command line does not parse")
        self.node(root, depth)

    def node(self, node: Node, depth: int) -> None:
        kind = node.type
        if kind == "ERROR" or node.is_missing:
            return  # (the line is undecided already; judge what did parse)
        if kind in _ONE_LINE and _newline_inside(node):
            self.out.undecided.append(f"a newline the parser reads across in {_text(node)!r}")
        if _unread_substitution(node):
            self.out.undecided.append(f"a substitution the parser did not read in "
                                      f"{_text(node)!r}")
        if kind == "command":
            self.command(node, depth)
        elif kind == "file_redirect":
            self.redirect(node)
        elif kind in ("ansi_c_string", "test_command", "compound_statement",
                      "c_style_for_statement"):
            self.bash_only(node)
        elif kind == "declaration_command":
            self.declaration(node)
        elif kind in ("variable_assignment", "for_statement"):
            name = node.child_by_field_name("name" if kind != "for_statement" else "variable")
            parent = node.parent.type if node.parent is not None else ""
            if name is not None and parent != "declaration_command":
                self.variable(_text(name), exported=parent == "command")
        for child in node.children:
            self.node(child, depth)

    def bash_only(self, node: Node) -> None:
        """Mark what dash (`/bin/sh`, which runs the line) reads otherwise than bash and
        the grammar: `$'...'` (no quoting to dash: `;` in it separates commands), `[[ ]]`
        and `(( ))` (commands and subshells to dash, `>` in them a redirection), a `>`
        or `<` in `[ ]` (a redirection to every shell, a comparison to the grammar)."""
        first = node.children[0].type if node.children else ""
        if node.type == "ansi_c_string":
            self.out.undecided.append(f"{_text(node)}: $'...' quoting, which dash lacks")
        elif node.type == "c_style_for_statement" or first in ("[[", "(("):
            self.out.undecided.append(f"{first or 'for (('} ...: bash syntax dash reads "
                                      "otherwise")
        elif first == "[" and _redirect_in_test(node):
            self.out.undecided.append("a > or < in [ ], a redirection to the shell")

    def declaration(self, node: Node) -> None:
        """Judge the names `export`, `readonly`, `local`, `declare`, `typeset` set, their
        quotes removed (`export 'PATH=.'` sets PATH as `export PATH=.` does)."""
        keyword, words = node.children[0].type, node.children[1:]
        options = [_text(w) for w in words if _text(w).startswith("-")]
        exported = keyword == "export" or any("x" in o for o in options)
        for word in words:
            if word.type == "variable_assignment":
                name = word.child_by_field_name("name")
                value = _text(name) if name is not None else None
            else:
                value = literal(word)
            if value is None:
                self.out.undecided.append(f"{keyword} {_text(word)}: a name built at run time")
            elif not value.startswith("-"):
                self.variable(value.split("=", 1)[0], exported=exported)

    def variable(self, name: str, exported: bool) -> None:
        """Judge setting the variable `name`: exported to a command (`A=1 cmd`, `export
        A`), any name but the harmless ones is undecided; set in the shell, the names
        that change what runs (they reach a program when already exported)."""
        if exported and name not in _HARMLESS_VARS:
            self.out.undecided.append(f"{name}= exported: a program may run what it holds")
        elif not exported and (name in _RISKY_VARS or _RISKY_PREFIX.match(name)):
            self.out.undecided.append(f"{name}= changes what commands run")

    def redirect(self, node: Node) -> None:
        op = next((c.type for c in node.children if c.type != "file_descriptor"), "")
        dest = node.child_by_field_name("destination") or node.children[-1]
        if op not in _WRITES or _text(dest) == "-" or (op == ">&" and dest.type == "number"):
            return  # a read, or `>&2` / `>&-` (a descriptor; `> 2` is the file 2)
        target = literal(dest)
        if target is None:
            self.out.undecided.append(f"a write to {_text(dest)} (an expanded name)")
        elif not _NOT_FILES.match(target):
            self.out.writes.append(lexical(target, self.cwd))

    def command(self, node: Node, depth: int) -> None:
        name = node.child_by_field_name("name")
        if name is None:
            return  # assignments only (`A=1`): checked as assignments
        words = [literal(name)]
        for arg in node.children_by_field_name("argument"):
            value = literal(arg)
            words.append(value if value is not None else _text(arg))
        if words[0] is None:
            self.out.undecided.append(f"the command name {_text(name)} is expanded")
            return
        self.words([w for w in words if w is not None], depth)

    def words(self, words: list[str], depth: int) -> None:
        """Judge one simple command given as its unquoted words (a wrapper's inner one too)."""
        first = words[0]
        if not _NAME.match(first):
            self.out.undecided.append(f"the command name {first} is expanded or a glob")
            return
        name = posixpath.basename(first) if "/" in first else first
        if "/" in first and not posixpath.normpath(first).startswith(_SYSTEM_BIN):
            # `./ls` is the project's own program (a cloned repository's, say), not ls.
            self.out.undecided.append(f"{first}: a program named by its path, outside the "
                                      "system's directories")
        args = words[1:]
        text = " ".join([name, *(self.arg(a) for a in args)])
        wrapper = WRAPPERS.get(name)
        if wrapper is not None:
            self.wrapped(name, wrapper, args, text, depth)
            return
        self.out.commands.append(Command(name, text))
        if name == "set" and any(a == "allexport" or a.startswith("-") and "a" in a[1:]
                                 for a in args):
            self.out.undecided.append("set -a exports every variable set after it")
        elif name == "read":
            for a in args:
                if not a.startswith("-"):
                    self.variable(a, exported=False)
        elif name == "alias" and args:
            self.out.undecided.append("alias: dash expands it in the commands after it")
        elif name == "git" and _git_config(args):
            self.out.undecided.append("git -c/--config-env: a setting can be a command "
                                      "git runs (core.fsmonitor, alias.x=!...)")
        elif name == "eval":
            self.code(" ".join(args), args, depth, "eval")
        elif name == "trap" and args:
            self.code(args[0], args[:1], depth, "trap")
        elif name in _SHELLS:
            code = _dash_c(args)
            if code is None:
                self.out.undecided.append(f"{name} runs a script or its input, unseen")
            else:
                self.code(code, [code], depth, f"{name} -c")
        elif name in ("source", "."):
            self.out.undecided.append(f"{name} runs a script, unseen")

    def wrapped(self, name: str, wrapper: Wrapper, args: list[str], text: str,
                depth: int) -> None:
        """Judge a wrapper's command (and the wrapper itself when it runs none)."""
        inner = _unwrap(wrapper, args)
        if wrapper.assignments:  # `env A=1 cmd`, `sudo A=1 cmd`: exported to cmd
            for a in args[:_options_end(wrapper, args)]:
                if _ASSIGN.match(a):
                    self.variable(a.split("=", 1)[0], exported=True)
        if name == "env" and _splits_a_string(args):
            self.out.undecided.append("env -S runs a string as a command line")
        if name == "xargs":
            self.xargs(args, inner)
        if inner is None or wrapper.judged_itself:
            self.out.commands.append(Command(name, text))
        if inner:
            self.words(inner, depth)

    def xargs(self, args: list[str], inner: list[str] | None) -> None:
        """xargs adds the words it reads to its command's: undecided when they could
        become a command (its command a wrapper or a shell, git given `-c`, or its
        input put in the command's name by -I)."""
        command = posixpath.basename(inner[0]) if inner else ""
        if command in WRAPPERS or command in _SHELLS or command == "git":
            self.out.undecided.append(f"xargs {command}: the words it reads may be code")
        replace = _xargs_replace(args[:_options_end(WRAPPERS["xargs"], args)])
        if inner and replace is not None and (not replace or replace in inner[0]):
            self.out.undecided.append("xargs -I: the command's name comes from its input")

    def code(self, code: str, parts: list[str], depth: int, what: str) -> None:
        if any(p.startswith("$") or "$(" in p or "`" in p for p in parts):
            self.out.undecided.append(f"{what} of code built at run time")
        else:
            self.line(code, depth + 1)

    def arg(self, word: str) -> str:
        """An argument as matched: a path written with `//`, `.`, `..` or a `/proc` alias
        of `/` as the path it names."""
        if word.startswith(("/", "~/")) or (
                "/" in word and ".." in word.split("/") and self.cwd):
            return lexical(word, self.cwd)
        return word


def _unwrap(wrapper: Wrapper, args: list[str]) -> list[str] | None:
    """The words of the command `wrapper` runs, or None when it runs none."""
    rest = args[_options_end(wrapper, args) + wrapper.leading:]
    return rest or None


def _options_end(wrapper: Wrapper, args: list[str]) -> int:
    """Where `wrapper`'s options (and assignments) end in `args`, read as getopt reads
    them: `-Eu root` ends in a value, so does an abridged `--sig KILL`."""
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return i + 1
        if a.startswith("--"):
            i += 2 if _long_takes_next(wrapper, a) else 1
        elif a.startswith("-") and len(a) > 1:
            i += 2 if _cluster_takes_next(wrapper, a) else 1
        elif wrapper.assignments and _ASSIGN.match(a):
            i += 1
        else:
            break
    return i


def _long_takes_next(wrapper: Wrapper, option: str) -> bool:
    """Whether a long option takes the next word: it names, whole or abridged as
    getopt_long allows, one with a value, and has no `=VALUE` of its own."""
    return "=" not in option and any(
        known.startswith(option) for known in wrapper.with_value if known[1] == "-")


def _cluster_takes_next(wrapper: Wrapper, cluster: str) -> bool:
    """Whether short options `-abc` take the next word: the first of them with a value
    is the last letter (`-Eu root`; in `-uroot` the value is the rest of the word)."""
    for i, letter in enumerate(cluster[1:], 1):
        if f"-{letter}" in wrapper.with_value:
            return i == len(cluster) - 1
    return False


def _splits_a_string(args: list[str]) -> bool:
    """Whether env's options hold -S (alone, in a cluster `-iS...`, or as a whole or
    abridged `--split-string`): a string env splits into a command line."""
    env = WRAPPERS["env"]
    for a in args[:_options_end(env, args)]:
        if a.startswith("--"):
            key = a.split("=", 1)[0]
            if len(key) > 2 and "--split-string".startswith(key):
                return True
        elif a.startswith("-"):
            for letter in a[1:]:
                if letter == "S":
                    return True
                if f"-{letter}" in env.with_value:
                    break  # (the rest is that option's value)
    return False


def _xargs_replace(options: list[str]) -> str | None:
    """The string xargs replaces by its input (-I R, -IR, -i, --replace=R), "" when a
    cluster of options hides it, None when there is none."""
    for i, a in enumerate(options):
        key = a.split("=", 1)[0]
        if len(key) > 2 and "--replace".startswith(key):
            return a.partition("=")[2] or "{}"
        if a.startswith("-I"):
            return a[2:] or (options[i + 1] if i + 1 < len(options) else "")
        if a.startswith("-i"):
            return a[2:] or "{}"
        if a.startswith("-") and not a.startswith("--") and ("I" in a or "i" in a):
            return ""
    return None


def _git_config(args: list[str]) -> bool:
    """Whether git's options before its subcommand set configuration (`-c`,
    `--config-env`) or where its programs are (`--exec-path`)."""
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i].startswith(("-c", "--config-env", "--exec-path")):
            return True
        i += 2 if args[i] in _GIT_VALUED else 1
    return False


def _dash_c(args: list[str]) -> str | None:
    """The code of `sh -c CODE`, `bash -lc CODE`, ...; None when there is no `-c`, or
    no word after it (`xargs sh -c`: the code comes from elsewhere)."""
    for i, a in enumerate(args):
        if a.startswith("-") and not a.startswith("--") and "c" in a[1:]:
            return args[i + 1] if i + 1 < len(args) else None
        if not a.startswith("-"):
            return None
    return None


def _newline_inside(node: Node) -> bool:
    """Whether a newline (not a line continuation) lies between the parts of `node`,
    where a shell would have ended the command the grammar goes on reading."""
    text, start, end = node.text or b"", node.start_byte, node.start_byte
    for child in node.children:
        if _NEWLINE.search(text[end - start:child.start_byte - start]):
            return True
        end = child.end_byte
    return bool(_NEWLINE.search(text[end - start:])) if node.child_count else False


def _unread_substitution(node: Node) -> bool:
    """Whether `node` is text the grammar left unparsed that a shell would run code in:
    a `$(` or a backtick in a plain word (``${x:-`cmd`}``: a word to the grammar) or in
    the body of an unquoted heredoc read as one piece (`<<-`: never parsed)."""
    if node.child_count or node.type not in _UNPARSED:
        return False
    if node.type == "heredoc_body" and _quoted_heredoc(node):
        return False  # (`<<'E'`: its body is not expanded)
    text = _text(node)
    return "`" in text or "$(" in text


def _quoted_heredoc(body: Node) -> bool:
    """Whether the heredoc `body` belongs to has a quoted delimiter (`<<'E'`, `<<"E"`,
    `<<\\E`): then nothing in it is expanded."""
    start = next((c for c in body.parent.children if c.type == "heredoc_start"), None) \
        if body.parent is not None else None
    return start is not None and any(q in _text(start) for q in "'\"\\")


def _redirect_in_test(node: Node) -> bool:
    """Whether a `>` or `<` token stands in `[ ... ]` outside a substitution (there the
    walk finds it as a redirection of its own command)."""
    for child in node.children:
        if child.type in ("command_substitution", "process_substitution", "string"):
            continue
        if ("<" in child.type or ">" in child.type) and child.child_count == 0:
            return True
        if _redirect_in_test(child):
            return True
    return False


def literal(node: Node) -> str | None:
    """The value of a word bash would not expand (quotes and backslashes removed), or
    None when it holds an expansion or a substitution."""
    kind = node.type
    if kind in ("word", "command_name"):
        if kind == "command_name":
            return literal(node.children[0]) if node.child_count == 1 else None
        return re.sub(r"\\(.)", r"\1", _text(node), flags=re.DOTALL)
    if kind == "number":
        return _text(node)
    if kind == "raw_string":
        return _text(node)[1:-1]
    if kind == "string":
        parts = []
        for c in node.children:
            if c.type == '"':
                continue
            if c.type != "string_content":
                return None
            parts.append(re.sub(r'\\([$`"\\\n])', r"\1", _text(c)))
        return "".join(parts)
    if kind == "concatenation":
        values = [literal(c) for c in node.children]
        return None if any(v is None for v in values) else "".join(v or "" for v in values)
    return None


def _text(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "surrogatepass")
