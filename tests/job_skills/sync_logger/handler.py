import logging

log = logging.getLogger("skill.sync_logger")


def execute(input_data, ctx):
    token = ctx.get("api_token", "")
    log.warning("calling the upstream API with token %s", token)
    return {"ok": True, "message": "called"}
