"""What the bad-input rounds assert about a refusal (docs/bad-input.md): exit status 2 and one line
on the output, ``Error: `` and the expected message first, never a traceback."""


def one_line(res, message: str) -> None:
    assert res.exit_code == 2, (res.exit_code, res.output)
    text = res.output.strip()
    assert len(text.splitlines()) == 1 and "Traceback" not in text, text
    assert text.startswith(f"Error: {message}"), text
