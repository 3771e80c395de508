"""The channel adapters of a process: built from the settings once per ``Services`` (their
token caches and rate limits live in them)."""

from __future__ import annotations

import weakref

import httpx
from arq.connections import ArqRedis
from pydantic import SecretStr

from delivery.channels.base import Channel
from delivery.channels.dingtalk import DingTalkChannel
from delivery.channels.feishu import FeishuChannel
from delivery.channels.limits import LINK_NOTES, LimitedChannel, LinkFor
from delivery.channels.telegram import TelegramChannel
from delivery.channels.web import WebChannel
from delivery.channels.wecom import WeComChannel
from delivery.ratelimit import RateLimiter
from jobs.db import Sessions
from jobs.links import file_link, file_link_key
from jobs.services import Services
from jobs.settings import Settings


def build_channels(
    settings: Settings,
    http: httpx.AsyncClient,
    *,
    sessionmaker: Sessions | None = None,
    redis: ArqRedis | None = None,
) -> dict[str, Channel]:
    """The configured adapters by channel name. ``web`` (and its alias ``web_admin``) is
    always present; it needs ``sessionmaker`` (and ``redis`` for live pushes) to send."""

    def secret(v: SecretStr | None) -> str:
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
    shared_limits(settings, out, redis)
    web = WebChannel(sessionmaker, redis, settings)
    out["web"] = web
    out["web_admin"] = web
    return out


def link_maker(settings: Settings) -> LinkFor | None:
    """``link_for(path)``: a signed ``/files/<token>`` download link under
    ``SKILLJOBS_PUBLIC_URL`` for a file inside the workspaces (None when unset)."""
    base = (settings.public_url or "").strip().rstrip("/")
    if not base:
        return None
    import os

    key = file_link_key(settings)
    root = os.path.realpath(settings.resolved_workspace_root)

    def link_for(path: str) -> str | None:
        real = os.path.realpath(path)
        if os.path.commonpath([real, root]) != root:
            return None
        return base + file_link(key, None, real, float(settings.file_link_ttl_sec))

    return link_for


def shared_limits(settings: Settings, out: dict[str, Channel], redis: ArqRedis | None) -> None:
    """The platform adapters get the download links (with notes in the deployment's
    language) and, with Redis, the rate limits every worker shares."""
    link_for = link_maker(settings)
    limiter = None
    if redis is not None:
        limiter = RateLimiter.from_settings(redis, settings)
    lang = settings.language if settings.language in LINK_NOTES else "en"
    for ch in out.values():
        if isinstance(ch, LimitedChannel):
            if ch.link_for is None:
                ch.link_for = link_for
            ch.limiter = limiter
            ch.lang = lang  # the language of the notes a link comes with


# Services → its adapters; kept here, by their owner, for as long as the Services lives.
_BUILT: weakref.WeakKeyDictionary[Services, dict[str, Channel]] = weakref.WeakKeyDictionary()


def channels_for(services: Services) -> dict[str, Channel]:
    """The process's adapters, built once per ``Services`` (token caches live in them)."""
    built = _BUILT.get(services)
    if built is None:
        built = _BUILT[services] = build_channels(
            services.settings,
            services.http,
            sessionmaker=services.sessionmaker,
            redis=services.redis,
        )
    return dict(built)


def use_channels(services: Services, channels: dict[str, Channel]) -> None:
    """Send ``services``' deliveries through ``channels`` (adapters built by the caller)."""
    _BUILT[services] = dict(channels)
