def handler():
    return "plain text"
