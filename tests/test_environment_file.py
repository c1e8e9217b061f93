"""systemd's EnvironmentFile= syntax: the values systemd passes, and the lines it ignores.

The cases marked ``test-env-file.c`` are systemd's own, from src/test/test-env-file.c
(https://github.com/systemd/systemd/blob/main/src/test/test-env-file.c), each with the
result systemd's test asserts after ``load_env_file()`` and the clean-up that
``exec_context_load_environment()`` applies (invalid names dropped). The others follow from
src/basic/env-file.c and systemd.exec(5), and are where python-dotenv reads the file
differently (checked against it below, so the table cannot drift into agreeing with it).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import pytest
from dotenv import dotenv_values

from gateway.config.environment_file import (
    MAX_BYTES,
    EnvironmentFileError,
    parse_environment_file,
    read_environment_file,
)


@dataclass(frozen=True)
class Case:
    why: str
    text: str
    variables: dict[str, str]

    def __str__(self) -> str:
        return self.why


SYSTEMD_TESTS = [
    Case(
        "test-env-file.c load_env_file_1: later entries win; a backslash continues a line",
        "a=a\na=b\na=b\na=a\nb=b\\\nc\nd= d\\\ne  \\\nf  \ng=g\\ \nh= ąęół\\ śćńźżμ \ni=i\\",
        {"a": "a", "b": "bc", "d": "de  f", "g": "g ", "h": "ąęół śćńźżμ", "i": "i"},
    ),
    Case("test-env-file.c load_env_file_2: a backslash at the end", "a=a\\\n", {"a": "a"}),
    Case(
        "test-env-file.c load_env_file_3: a comment ends at its line, backslash or not",
        '#SPAMD_ARGS="-d --socketpath=/var/lib/bulwark/spamd \\\n'
        "#--nouser-config                                     \\\n"
        "normal1=line\\\n111\n"
        ";normal=ignored                                      \\\n"
        "normal2=line222\n"
        "normal ignored                                       \\\n",
        {"normal1": "line111", "normal2": "line222"},
    ),
    Case(
        "test-env-file.c load_env_file_4: comments, blank lines, a quoted value",
        '# Generated\n\nHWMON_MODULES="coretemp f71882fg"\n\n# For compatibility reasons\n\n'
        "MODULE_0=coretemp\nMODULE_1=f71882fg",
        {"HWMON_MODULES": "coretemp f71882fg", "MODULE_0": "coretemp", "MODULE_1": "f71882fg"},
    ),
    Case("test-env-file.c load_env_file_5: empty values", "a=\nb=", {"a": "", "b": ""}),
    Case(
        "test-env-file.c load_env_file_6: backslashes unquoted, in '' and in \"\"",
        "a=\\ \\n \\t \\x \\y \\' \n"
        "b= \\$'                  \n"
        "c= ' \\n\\t\\$\\`\\\\\n'   \n"
        'd= " \\n\\t\\$\\`\\\\\n"   \n',
        {"a": " n t x y '", "b": "$'", "c": " \\n\\t\\$\\`\\\\\n", "d": " \\n\\t$`\\\n"},
    ),
    Case(
        "test-env-file.c parse_env_file: no inline comments, no export, quotes join",
        "one=BAR   \n# comment\n # comment \n ; comment \n  two   =   bar    \n"
        "invalid line\ninvalid line #comment\n"
        'three = "333\nxxxx"\n'
        "four = '44\\\"44'\n"
        'five = "55\\"55" "FIVE" cinco   \n'
        "six = seis sechs\\\n sis\n"
        'seven="sevenval" #nocomment\n'
        "eight=eightval #nocomment\n"
        "export nine=nineval\n"
        "ten=ignored\nten=ignored\nten=\n"
        "eleven=\\value\n"
        'twelve="\\value"\n'
        "thirteen='\\value'",
        {
            "one": "BAR",
            "two": "bar",
            "three": "333\nxxxx",
            "four": '44\\"44',
            "five": '55"55FIVEcinco',
            "six": "seis sechs sis",
            "seven": "sevenval#nocomment",
            "eight": "eightval #nocomment",
            "ten": "",
            "eleven": "value",
            "twelve": "\\value",
            "thirteen": "\\value",
        },
    ),
    Case(
        "test-env-file.c parse_multiline_env_file: continued lines keep their blanks",
        "one=BAR\\\n\\ \\ \\ \\ VAR\\\n\\\tGAR\n#comment\n"
        'two="bar\\\n    var\\\n\tgar"\n#comment\n'
        'tri="bar \\\n    var \\\n\tgar "\n',
        {"one": "BAR    VAR\tGAR", "two": "bar    var\tgar", "tri": "bar     var \tgar "},
    ),
]

WHERE_DOTENV_DIFFERS = [
    Case("an inline comment is part of the value", "KEY=s3cret # old\n", {"KEY": "s3cret # old"}),
    Case("${VAR} is not expanded", "HOME_TOO=${HOME}/x\n", {"HOME_TOO": "${HOME}/x"}),
    Case("export is not a keyword", "export KEY=s3cret\n", {}),
    Case("a quoted value joins what follows it", 'KEY="s3cret"x\n', {"KEY": "s3cretx"}),
    Case("\\n in double quotes stays two characters", 'KEY="a\\nb"\n', {"KEY": "a\\nb"}),
]


class TestValues:
    @pytest.mark.parametrize("case", SYSTEMD_TESTS, ids=str)
    def test_systemds_own_cases_give_systemds_values(self, case: Case) -> None:
        """Each file from systemd's test suite gives the variables systemd's test asserts."""
        assert parse_environment_file(case.text.encode()).variables == case.variables

    @pytest.mark.parametrize("case", WHERE_DOTENV_DIFFERS, ids=str)
    def test_values_follow_systemd_where_dotenv_reads_otherwise(self, case: Case) -> None:
        """Where python-dotenv reads a line otherwise, the parser gives systemd's value."""
        assert parse_environment_file(case.text.encode()).variables == case.variables
        assert dotenv_values(stream=io.StringIO(case.text)) != case.variables

    def test_a_file_saved_with_crlf_reads_as_with_lf_but_for_continuations(self) -> None:
        """systemd ends a line at CR too (its NEWLINE is CR and LF), so CRLF lines read as
        LF lines; but a backslash then escapes only the CR, and the LF ends the value."""
        text = "A=1 \nB='2'\n"
        crlf = parse_environment_file(text.replace("\n", "\r\n").encode())
        assert crlf.variables == parse_environment_file(text.encode()).variables
        continued = parse_environment_file(b"C=3\\\r\n4\r\n")
        assert continued.variables == {"C": "3"}
        assert continued.warnings == [(2, "no '=' on this line: systemd ignores it")]

    def test_each_variable_is_placed_at_the_line_of_its_last_assignment(self) -> None:
        """Lines are counted as an editor does, continuation lines included."""
        parsed = parse_environment_file(b"# x\nA=1\\\n2\n\nB='3\n4'\nA=5\n")
        assert parsed.lines == {"A": 7, "B": 5}


class TestIgnoredLines:
    @pytest.mark.parametrize(
        ("text", "warnings"),
        [
            ("ALICE_KEY\n", [(1, "no '=' on this line: systemd ignores it")]),
            ("A=1\nB", [(2, "no '=' on this line: systemd ignores it")]),
            (
                "A=1\n\nexport KEY=x\n",
                [
                    (
                        3,
                        "'export KEY' is not a variable name: systemd ignores this line "
                        "(write it without 'export')",
                    )
                ],
            ),
            ("1A=x\n", [(1, "'1A' is not a variable name: systemd ignores this line")]),
            ("A-B=x\n", [(1, "'A-B' is not a variable name: systemd ignores this line")]),
            (
                "\ufeffA=x\n",
                [
                    (
                        1,
                        "'\\ufeffA' is not a variable name: systemd ignores this line "
                        "(the file starts with a byte-order mark: save it without one)",
                    )
                ],
            ),
            ("A=1\nA=2\n", [(1, "A is set again on line 2, which wins")]),
            (
                "# old \\\nA=1\n",
                [(2, "systemd before v254 ignores this line: the comment above ends in '\\'")],
            ),
            (
                'A="1\nB="2"\n',
                [(1, "a quoted value runs on to line 2: it holds line breaks")],
            ),
            (
                "A=1\nB='2\n",
                [(2, "the quote opened here is never closed: the value is the rest of the file")],
            ),
        ],
    )
    def test_a_line_systemd_ignores_or_misreads_is_named_by_its_number(
        self, text: str, warnings: list[tuple[int, str]]
    ) -> None:
        """Each line systemd drops (or reads surprisingly) gives one warning at its line."""
        assert parse_environment_file(text.encode()).warnings == warnings

    def test_a_clean_file_gives_no_warnings(self) -> None:
        """Comments, blank lines and quoted values that close on their line warn of nothing."""
        text = '# keys\n\n; more\nALICE_KEY=\'a b\'\nBOB_KEY="c\\"d" \nFAIRGATE_LISTEN=8080\n'
        assert parse_environment_file(text.encode()).warnings == []


class TestRefusedFiles:
    @pytest.mark.parametrize(
        "text",
        ["fo\ufffeo=bar", "foo=b\uffffar", "baz=hello world\ufffe"],
        ids=["key", "value", "value end"],
    )
    def test_systemds_invalid_utf8_cases_refuse_the_whole_file(self, text: str) -> None:
        """test-env-file.c load_env_file_invalid_utf8: a noncharacter fails the whole file."""
        with pytest.raises(EnvironmentFileError, match="line 1: not UTF-8"):
            parse_environment_file(text.encode())

    def test_a_bad_byte_in_a_value_refuses_the_whole_file_at_its_line(self) -> None:
        """A Latin-1 byte in a value: systemd reads none of the file, not even line 1."""
        with pytest.raises(EnvironmentFileError, match=r"^line 2: not UTF-8"):
            parse_environment_file(b"A=1\nB=caf\xe9\n")

    def test_a_bad_byte_in_a_comment_is_harmless(self) -> None:
        """Only names and values are checked, as systemd checks them."""
        assert parse_environment_file(b"# caf\xe9\nA=1\n").variables == {"A": "1"}

    def test_a_nul_byte_refuses_the_whole_file(self) -> None:
        """systemd's read_full_stream() refuses a file with an embedded NUL (EBADMSG)."""
        with pytest.raises(EnvironmentFileError, match=r"^line 3: a NUL byte"):
            parse_environment_file(b"A=1\n# x\nB=\x00\n")

    def test_a_file_past_the_bound_is_refused_without_reading_it_all(self, tmp_path: Path) -> None:
        """Reading stops one byte past the bound."""
        path = tmp_path / "big.env"
        path.write_bytes(b"A=" + b"x" * MAX_BYTES + b"\n")
        with pytest.raises(EnvironmentFileError, match="larger than"):
            read_environment_file(path)

    def test_a_missing_file_says_why(self, tmp_path: Path) -> None:
        """An unreadable file is an EnvironmentFileError with the system's reason."""
        with pytest.raises(EnvironmentFileError, match="cannot read: No such file"):
            read_environment_file(tmp_path / "absent.env")
