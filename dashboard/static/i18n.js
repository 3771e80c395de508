// Dashboard texts in English and Chinese. The language: the page's switch (kept in this
// browser), else SKILLJOBS_LANGUAGE when the server sets it, else the browser's language.
// Static texts of the page are translated where they appear (a text node or a
// placeholder/title/aria-label equal to an English key); the script's own messages go
// through t(). Data from the API (skill names, errors, results) is never translated.
"use strict";

const LANG_KEY = "skilljobs.lang";
const ZH = {
  // tabs and page chrome
  "Overview": "总览", "Jobs": "任务", "Schedules": "定时任务", "Deliveries": "投递",
  "Incidents": "故障", "Workers": "工作进程", "Audit": "审计", "Sign out": "退出登录",
  "● live": "● 实时", "live updates": "实时更新",
  "API token": "API 令牌", "token": "令牌", "Open dashboard": "打开控制台",
  "This dashboard needs the token set in": "此控制台需要",
  "The token was not accepted.": "令牌无效。",
  "Cannot reach the API:": "无法连接 API：",
  // overview
  "Queued": "排队中", "Running": "运行中", "Oldest waiting": "最久等待", "Workers alive": "存活进程",
  "Over time": "趋势", "1 hour": "1 小时", "24 hours": "24 小时",
  "Jobs finished per minute": "每分钟完成任务数", "Queue depth (waiting)": "队列深度（等待中）",
  "Deliveries per minute, by status": "每分钟投递数（按状态）",
  "Queue wait and run time per skill": "各技能排队与运行时间", "Throughput": "吞吐量",
  "Skills": "技能", "(last 24 h)": "（最近 24 小时）", "Failing deliveries": "失败的投递",
  "window": "时间窗", "succeeded": "成功", "failed": "失败", "timed out": "超时", "cancelled": "已取消",
  "per min": "每分钟", "failure rate": "失败率", "skill": "技能", "jobs": "任务数",
  "wait p50": "等待 p50", "wait p95": "等待 p95", "run p50": "运行 p50", "run p95": "运行 p95",
  "queued": "排队中", "running": "运行中", "when": "时间", "recipient": "接收方", "kind": "类型",
  "tries": "尝试", "error": "错误", "job": "任务", "paused": "已暂停", "Pause": "暂停", "Resume": "恢复",
  "this skill is paused": "此技能已暂停", "Requeue failed": "重新排队失败任务",
  // jobs
  "search": "搜索", "id prefix, skill or error": "编号前缀、技能或错误",
  "select all on this page": "选择本页全部", "language": "语言", "background": "后台",
  "Pause a skill": "暂停技能", "(its jobs stay queued until it is resumed)": "（其任务保持排队，直到恢复）",
  "no skills": "没有技能", "forgotten": "已移除", "processed / failed": "已处理 / 失败",
  "pages": "页面", "no data": "无数据", "None failed.": "没有失败。", "no failed deliveries": "没有失败的投递",
  "no jobs in the last 24 hours": "最近 24 小时没有任务", "partial": "部分结果",
  "timed_out": "超时", "sending": "发送中", "sent": "已发送", "pending": "待发送", "unknown": "未知",
  "dismissed": "已忽略", "stopped_empty": "空结果停止", "skipped": "已跳过", "missed": "已错过", "status": "状态", "channel": "渠道", "role": "角色", "since": "起始",
  "until": "截止", "any": "任意", "all time": "全部时间", "15 min": "15 分钟", "2 hours": "2 小时",
  "7 days": "7 天", "Apply": "应用", "Clear": "清除", "created": "创建时间", "id": "编号",
  "attempts": "尝试次数", "took": "耗时", "no jobs match": "没有匹配的任务",
  "Retry all matching…": "重试所有匹配的…", "Cancel all matching…": "取消所有匹配的…",
  "Retry selected": "重试所选", "Cancel selected": "取消所选", "Delete selected": "删除所选",
  "Clear selection": "清除选择", "Retry": "重试", "Cancel": "取消", "Delete": "删除",
  "close": "关闭", "link": "链接", "Attempts": "尝试记录", "Input": "输入", "(secrets masked)": "（密钥已隐藏）",
  "Result": "结果", "Artifacts": "文件", "Fetches": "下载", "reason": "原因", "url": "网址", "field": "字段",
  "← newer": "← 较新", "older →": "较旧 →", "deleted": "已删除",
  "Acts on every job this filter matches (not only this page), at most 10,000 at once.":
    "作用于此筛选匹配的所有任务（不只本页），一次最多 10,000 个。",
  "Filter the list to act on every matching job.": "先筛选列表，再对所有匹配的任务操作。",
  "Acts on every job this filter matches.": "作用于此筛选匹配的所有任务。",
  // schedules
  "name": "名称", "cron": "cron", "timezone": "时区", "enabled": "启用", "next fire": "下次触发",
  "last run": "上次运行", "yes": "是", "no": "否", "Disable": "停用", "Enable": "启用",
  "Run now": "立即运行", "no schedules": "没有定时任务", "New schedule": "新建定时任务",
  "Edit": "编辑", "Save": "保存", "Chain run": "链运行", "schedule": "定时任务",
  "Schedule (JSON, the schedule file's fields)": "定时任务（JSON，与定时任务文件字段相同）",
  // deliveries, incidents, workers, audit
  "Channel health": "渠道健康", "deliveries": "投递数", "failed or unknown": "失败或未知",
  "rate-limit waits": "限流等待", "count": "次数", "first seen": "首次出现", "last seen": "最近出现",
  "sample jobs": "示例任务", "Acknowledge": "确认", "open": "未处理", "acked": "已确认",
  "worker": "工作进程", "host": "主机", "pid": "进程号", "last heartbeat": "最近心跳", "state": "状态",
  "current jobs": "当前任务", "concurrency": "并发", "processed": "已处理", "RSS": "内存",
  "started at": "启动时间", "version": "版本", "alive": "存活", "stale": "失联", "stopped": "已停止",
  "Drain": "排空", "Forget": "移除", "no worker has reported yet": "还没有工作进程上报",
  "actor": "操作者", "action": "动作", "target": "对象", "who": "谁", "what": "什么", "result": "结果",
  "Resend": "重新发送", "Dismiss": "忽略",
  // messages built by the script
  "{n} selected": "已选 {n} 个", "page {n}": "第 {n} 页",
  "{verb} {n} selected job(s)?": "{verb}所选的 {n} 个任务？",
  "{verb}: {done} of {n} job(s)": "{verb}：{n} 个中完成 {done} 个", ", {k} refused": "，{k} 个被拒绝",
  "{verb} job {id} ({skill})?": "{verb}任务 {id}（{skill}）？",
  "Pause skill {skill}? Its queued jobs wait until it is resumed.": "暂停技能 {skill}？其排队任务将等待到恢复。",
  "{skill}: paused": "{skill}：已暂停", "{skill}: resumed": "{skill}：已恢复",
  "Forget worker {id}? It is removed from this list.": "移除工作进程 {id}？它将从列表中删除。",
  "Delete schedule {name} and its run history?": "删除定时任务 {name} 及其运行记录？",
  "{name}: deleted": "{name}：已删除", "{name}: saved": "{name}：已保存",
  "read only": "只读",
  "Requeue every failed job of {skill}?": "重新排队 {skill} 的所有失败任务？",
  "No job matches {what}.": "没有任务匹配 {what}。",
  "{verb} {n} job(s) matching {what}?": "{verb}匹配 {what} 的 {n} 个任务？",
  "{verb} schedule {name}?": "{verb}定时任务 {name}？", "disabled": "已停用",
  "Run schedule {name} now?": "立即运行定时任务 {name}？",
  "incident of {skill} acknowledged": "{skill} 的故障已确认",
  "{verb} worker {id}?": "{verb}工作进程 {id}？",
  "It is removed from this list (it has stopped).": "它将从列表中移除（已停止）。",
  "It finishes what it runs and takes no new jobs until resumed.": "它会完成正在运行的任务，恢复前不再领取新任务。",
  "It takes no new jobs, finishes what it runs, then exits.": "它不再领取新任务，完成正在运行的任务后退出。",
  "resumed": "已恢复", "draining: it exits once its jobs finish": "排空中：任务完成后退出",
  // limits, delayed jobs, chain graphs
  "Limits": "限额",
  "Start rates and concurrency per skill, org or role, shared by all workers. A job over a limit waits, queued.":
    "按技能、组织或角色设置的启动速率与并发上限，所有工作进程共享。超出限额的任务保持排队等待。",
  "key": "键", "rate": "速率", "concurrency": "并发", "tokens now": "当前令牌", "from": "来源",
  "Set": "设置", "Unset": "取消", "no limits": "没有限额", "scheduled": "已安排", "runs at": "运行时间",
  // messages built by the script (deliveries, chain runs, schedules, limits)
  "{verb} done": "{verb}已完成", "requeued": "已重新排队", "resend": "重新发送", "dismiss": "忽略",
  "No schedule {id}": "没有定时任务 {id}", "Runs of {name}": "{name} 的运行记录",
  "{name}: run {run} started": "{name}：运行 {run} 已开始",
  "Re-run this chain from step {step} (earlier steps keep their recorded outputs)?":
    "从步骤 {step} 重新运行此链？（之前的步骤沿用已记录的输出）",
  "new run {run} from step {step}": "已从步骤 {step} 开始新的运行 {run}",
  "delivery to {recipient} ({status})": "发给 {recipient} 的投递（{status}）",
  "{n} deliveries": "{n} 条投递", "{verb} {what}?": "{verb}{what}？",
  " An unknown delivery may have arrived already: the recipient can get it twice.":
    " 状态未知的投递可能已经送达：接收方可能会收到两次。",
  " An unknown delivery may have arrived already: its recipient can get it twice.":
    " 状态未知的投递可能已经送达：接收方可能会收到两次。",
  "{verb}: {done} of {n}": "{verb}：{n} 条中完成 {done} 条",
  "{n} sends, {time} in all": "{n} 次发送，共等待 {time}",
  "No delivery matches {what}.": "没有投递匹配 {what}。",
  " The oldest {n} are taken now; run it again for the rest.": " 本次处理最早的 {n} 条；其余的请再执行一次。",
  "{verb} {n} deliveries matching {what} (last 7 days)?": "{verb}匹配 {what} 的 {n} 条投递（最近 7 天）？",
  "Remove the run-time limit of {key}?": "移除 {key} 的运行时限额？",
  "{key}: run-time limit removed": "{key}：运行时限额已移除", "{key}: limit set": "{key}：限额已设置",
  "Resend all matching…": "重新发送所有匹配的…", "Dismiss all matching…": "忽略所有匹配的…",
  "Re-run from here": "从这里重新运行", "chain run": "链运行",
  "a signed link, valid for a day: no token needed": "签名链接，一天内有效：无需令牌",
  "deliveries per minute": "每分钟投递数", "jobs finished per minute": "每分钟完成任务数",
  "error type": "错误类型", "external id": "外部编号", "graph of the chain run": "链运行图",
  "its schedule": "所属定时任务", "jobs waiting": "等待中的任务", "last fire": "上次触发",
  "live off": "实时更新已关闭", "live on": "实时更新已开启", "next fires": "接下来的触发时间",
  "no deliveries in the last 24 hours": "最近 24 小时没有投递", "no deliveries match": "没有匹配的投递",
  "no finished jobs": "没有已完成的任务", "no incidents": "没有故障", "no runs yet": "还没有运行记录",
  "no steps": "没有步骤", "not started yet": "尚未开始", "nothing recorded yet": "还没有记录",
  "preparing environment": "正在准备环境", "role / org": "角色 / 组织",
  "stopped by the empty-result guard": "因结果为空而停止", "— stopped by the empty-result guard": "— 因结果为空而停止",
  "trace id": "追踪编号", "wall clock": "运行时限", "– (disabled)": "–（已停用）", "· for each": "· 逐项",
  "download": "下载", "chart window": "图表时间窗", "job detail": "任务详情", "press / to focus": "按 / 聚焦",
  "sends that waited for the outbound rate limiter, all workers, since they began counting":
    "因出站限流而等待的发送（所有工作进程，自开始计数起）",
  "(or the read-only": "（或只读令牌",
  "(jobs finished in the last 24 hours)": "（最近 24 小时完成的任务）",
  "(jobs finished in the last hour)": "（最近 1 小时完成的任务）",
  "trigger": "触发方式", "fire": "触发时间", "started": "开始时间", "finished": "结束时间",
  "input": "输入", "output": "输出", "none": "无", "rerun": "重新运行", "manual": "手动",
  "JSON: {error}": "JSON 有误：{error}", "{n} open": "{n} 个未处理",
};
const DICTS = { zh: ZH };

let LANG = "en";

function t(text, vars) {
  let out = (DICTS[LANG] && DICTS[LANG][text]) || text;
  for (const [k, v] of Object.entries(vars || {})) out = out.split(`{${k}}`).join(String(v));
  return out;
}

// Originals of translated text nodes and attributes, so switching back restores them.
const ORIGINAL = new WeakMap();
const ATTRS = ["placeholder", "title", "aria-label"];
const SKIP = new Set(["PRE", "CODE", "SCRIPT", "STYLE", "TEXTAREA"]);

function skipped(node) {
  for (let p = node.parentElement; p; p = p.parentElement) {
    if (SKIP.has(p.tagName) || p.classList.contains("mono") || p.classList.contains("data")) return true;
  }
  return false;
}

function translateNode(node) {
  if (node.nodeType === Node.TEXT_NODE) {
    const key = ORIGINAL.has(node) ? ORIGINAL.get(node) : node.nodeValue;
    const trimmed = key.trim();
    if (!trimmed || skipped(node)) return;
    const dict = DICTS[LANG];
    if (dict && dict[trimmed]) {
      if (!ORIGINAL.has(node)) ORIGINAL.set(node, key);
      const next = key.replace(trimmed, dict[trimmed]);
      if (node.nodeValue !== next) node.nodeValue = next;
    } else if (ORIGINAL.has(node) && node.nodeValue !== key) {
      node.nodeValue = key;
    }
    return;
  }
  if (node.nodeType !== Node.ELEMENT_NODE || SKIP.has(node.tagName)) return;
  for (const attr of ATTRS) {
    if (!node.hasAttribute(attr)) continue;
    const store = `i18n${attr.replace(/-./g, (m) => m[1].toUpperCase())}`;
    const key = node.dataset[store] || node.getAttribute(attr);
    const dict = DICTS[LANG];
    if (dict && dict[key]) {
      node.dataset[store] = key;
      node.setAttribute(attr, dict[key]);
    } else if (node.dataset[store]) {
      node.setAttribute(attr, node.dataset[store]);
    }
  }
  for (const child of node.childNodes) translateNode(child);
}

function chooseLanguage(serverLanguage) {
  const picked = localStorage.getItem(LANG_KEY);
  const browser = (navigator.language || "en").toLowerCase();
  const lang = picked || serverLanguage || (browser.startsWith("zh") ? "zh" : "en");
  setLanguage(lang === "zh" ? "zh" : "en", false);
}

function setLanguage(lang, remember) {
  LANG = lang;
  if (remember) localStorage.setItem(LANG_KEY, lang);
  document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
  const pick = document.querySelector("#lang");
  if (pick) pick.value = lang;
  translateNode(document.body);
}

// Everything the script adds later is translated as it appears.
new MutationObserver((records) => {
  if (LANG === "en") return;
  for (const r of records) {
    if (r.type === "characterData") translateNode(r.target);
    for (const n of r.addedNodes) translateNode(n);
  }
}).observe(document.documentElement, { childList: true, subtree: true, characterData: true });
