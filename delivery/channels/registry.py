"""The channel adapters of a process: built from the settings once per ``Services`` (their
token caches and rate limits live in them)."""

from __future__ import annotations

from typing import Any

import httpx

from delivery.channels.base import Channel
from delivery.channels.dingtalk import DingTalkChannel
from delivery.channels.feishu import FeishuChannel
from delivery.channels.telegram import TelegramChannel
from delivery.channels.web import WebChannel
from delivery.channels.wecom import WeComChannel
from jobs.services import Services
from jobs.settings import Settings


def build_channels(
    settings: Settings,
    http: httpx.AsyncClient,
    *,
    sessionmaker: Any = None,
    redis: Any = None,
) -> dict[str, Channel]:
    """The configured adapters by channel name. ``web`` (and its alias ``web_admin``) is
    always present; it needs ``sessionmaker`` (and ``redis`` for live pushes) to send."""

    def secret(v: Any) -> str:
        return v.get_secret_value() if v is not None else ""

    out: dict[str, Channel] = {}
    if settings.telegram_bot_token:
        out["telegram"] = TelegramChannel(
            http,
            secret(settings.telegram_bot_token),
            api_base=settings.telegram_api_base,
            allow_hosts=settings.allow_hosts,
        )
    if settings.feishu_app_id and settings.feishu_app_secret:
        out["feishu"] = FeishuChannel(
            http,
            settings.feishu_app_id,
            secret(settings.feishu_app_secret),
            api_base=settings.feishu_api_base,
        )
    if settings.wecom_corp_id and settings.wecom_corp_secret and settings.wecom_agent_id:
        out["wecom"] = WeComChannel(
            http,
            settings.wecom_corp_id,
            secret(settings.wecom_corp_secret),
            settings.wecom_agent_id,
            api_base=settings.wecom_api_base,
        )
    if settings.dingtalk_app_key and settings.dingtalk_app_secret and settings.dingtalk_robot_code:
        out["dingtalk"] = DingTalkChannel(
            http,
            settings.dingtalk_app_key,
            secret(settings.dingtalk_app_secret),
            settings.dingtalk_robot_code,
            api_base=settings.dingtalk_api_base,
            oapi_base=settings.dingtalk_oapi_base,
        )
    web = WebChannel(sessionmaker, redis, settings)
    out["web"] = web
    out["web_admin"] = web
    return out


def channels_for(services: Services) -> dict[str, Channel]:
    """The process's adapters, built once per ``Services`` (token caches live in them)."""
    if services.channels is None:
        services.channels = build_channels(
            services.settings,
            services.http,
            sessionmaker=services.sessionmaker,
            redis=services.redis,
        )
    return dict(services.channels)
