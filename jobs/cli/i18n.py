"""The CLI's own texts in Chinese when ``SKILLJOBS_LANGUAGE=zh`` (else when the locale,
``LC_ALL`` / ``LANG``, is Chinese). Piped output (tab-separated headers, ``--json``) stays
as it is: scripts read it."""

from __future__ import annotations

import os
from typing import Any

ZH: dict[str, str] = {
    "error: ": "错误：",
    "  fix: ": "  解决：",
    "invalid settings: {problems}": "设置无效：{problems}",
    "SKILLJOBS_DATABASE_URL is not a usable database URL ({reason})": (
        "SKILLJOBS_DATABASE_URL 不是可用的数据库地址（{reason}）"
    ),
    "use postgresql://user:password@host:5432/name or sqlite:///path/to/file.db "
    "(unset: the SQLite file in SKILLJOBS_DATA_DIR)": (
        "请使用 postgresql://用户:密码@主机:5432/库名 或 sqlite:///文件路径.db"
        "（不设置时使用 SKILLJOBS_DATA_DIR 中的 SQLite 文件）"
    ),
    "the database at {url} has no skilljobs tables": "{url} 的数据库中没有 skilljobs 的表",
    "run `skilljobs db upgrade` (or start `skilljobs up`, which migrates)": (
        "运行 `skilljobs db upgrade`（或启动会自动迁移的 `skilljobs up`）"
    ),
    "Redis at {url} refused the password ({reason})": "{url} 的 Redis 拒绝了密码（{reason}）",
    "put the right password in SKILLJOBS_REDIS_URL (redis://:PASSWORD@host:6379/0)": (
        "在 SKILLJOBS_REDIS_URL 中填写正确的密码（redis://:密码@主机:6379/0）"
    ),
    "cannot reach Redis at {url}: {reason}": "无法连接 {url} 的 Redis：{reason}",
    "start Redis or set SKILLJOBS_REDIS_URL to a reachable one "
    "(`skilljobs up` starts an embedded one; `skilljobs doctor` checks every setting)": (
        "请启动 Redis，或把 SKILLJOBS_REDIS_URL 设为可连接的地址"
        "（`skilljobs up` 会启动内置 Redis；`skilljobs doctor` 检查所有设置）"
    ),
    "cannot use the database at {url}: {reason}": "无法使用 {url} 的数据库：{reason}",
    "start the database or fix SKILLJOBS_DATABASE_URL (host, port, user, password, name); "
    "`skilljobs doctor` checks every setting": (
        "请启动数据库，或修正 SKILLJOBS_DATABASE_URL（主机、端口、用户、密码、库名）；"
        "`skilljobs doctor` 检查所有设置"
    ),
    "a service is unreachable: {reason}": "有服务无法连接：{reason}",
    "check SKILLJOBS_DATABASE_URL and SKILLJOBS_REDIS_URL; `skilljobs doctor` checks them": (
        "请检查 SKILLJOBS_DATABASE_URL 和 SKILLJOBS_REDIS_URL；`skilljobs doctor` 会检查它们"
    ),
    " (--debug shows the traceback)": "（加 --debug 查看调用栈）",
    "{name}: paused — workers take none of its jobs (they stay queued) until "
    "`skilljobs skills resume {name}`": (
        "{name}：已暂停——工作进程不再领取它的任务（任务保持排队），"
        "直到运行 `skilljobs skills resume {name}`"
    ),
    "{name}: resumed — workers take its jobs again ({n} waiting put back)": (
        "{name}：已恢复——工作进程重新领取它的任务（{n} 个等待中的任务已放回队列）"
    ),
    "schedule {name} ({id}) deleted": "定时任务 {name}（{id}）已删除",
    "Delete schedule {name} and its run history?": "删除定时任务 {name} 及其运行记录？",
    "nothing done": "未做任何更改",
    "dry run: ": "试运行：",
    "no schedules": "没有定时任务",
    "{n} created": "新建 {n} 个",
    "{n} updated": "更新 {n} 个",
    "{n} unchanged": "{n} 个未变",
    "{n} deleted": "删除 {n} 个",
    "create": "新建",
    "update": "更新",
    "unchanged": "未变",
    "delete": "删除",
    "{n} file(s) with problems; nothing changed": "{n} 个文件有问题；未做任何更改",
}

# Column headers of terminal tables.
ZH_COLUMNS = {
    "id": "编号", "skill": "技能", "status": "状态", "attempts": "尝试次数", "channel": "渠道",
    "created": "创建时间", "duration": "耗时", "error": "错误", "name": "名称",
    "timezone": "时区", "enabled": "启用", "next fire": "下次触发", "last run": "上次运行",
    "steps": "步骤", "run": "运行", "trigger": "触发方式", "fire time": "触发时间",
    "finished": "完成时间", "host": "主机", "pid": "进程号", "state": "状态", "flags": "标记",
    "running": "运行中", "last heartbeat": "最近心跳", "type": "类型", "count": "次数",
    "first seen": "首次出现", "last seen": "最近出现", "recipient": "接收方", "kind": "类型",
    "job": "任务", "gen": "代", "updated": "更新时间", "error / receipt": "错误 / 回执",
    "key": "键", "value": "值",
}  # fmt: skip


def language() -> str:
    """``zh`` or ``en``: SKILLJOBS_LANGUAGE, else the locale."""
    chosen = os.environ.get("SKILLJOBS_LANGUAGE", "").strip().lower()
    if not chosen:
        chosen = (os.environ.get("LC_ALL") or os.environ.get("LANG") or "").lower()
    return "zh" if chosen.startswith("zh") else "en"


def tr(text: str, **values: Any) -> str:
    """``text`` (an English template) in the CLI's language, filled in."""
    template = ZH.get(text, text) if language() == "zh" else text
    return template.format(**values) if values else template


def column(name: str) -> str:
    return ZH_COLUMNS.get(name, name) if language() == "zh" else name
