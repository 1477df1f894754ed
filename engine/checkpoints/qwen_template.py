# ruff: noqa: E501  (the template is data: its long lines are literal prompt text)
"""A Qwen3.5-style chat template (Jinja), written for deltaserve's generated checkpoints.

Behaviour follows docs/qwen35.md section 6: no default system prompt, a system message only first,
every content trimmed, reasoning shown only for assistant turns after the last real user query,
XML tool calls, tool results wrapped in ``<tool_response>`` inside a user turn, and the 4B default
generation prompt ``<think>\\n`` (``enable_thinking=False`` closes an empty think block).
"""

from __future__ import annotations

QWEN35_CHAT_TEMPLATE = r"""
{%- macro render_content(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is none or content is undefined -%}
{%- elif content is mapping -%}{{ raise_exception('message content must be a string or a list of parts') }}
{%- elif content is iterable -%}
{%- for part in content -%}
{%- if part is string -%}{{ part }}
{%- elif part is mapping and part.type == 'text' -%}{{ part.text }}
{%- elif part is mapping and (part.type in ['image', 'image_url'] or 'image' in part or 'image_url' in part) -%}<|vision_start|><|image_pad|><|vision_end|>
{%- elif part is mapping and (part.type in ['video', 'video_url'] or 'video' in part) -%}<|vision_start|><|video_pad|><|vision_end|>
{%- else -%}{{ raise_exception('unsupported content part') }}
{%- endif -%}
{%- endfor -%}
{%- else -%}{{ raise_exception('message content must be a string or a list of parts') }}
{%- endif -%}
{%- endmacro -%}
{%- if not messages %}{{ raise_exception('No messages provided.') }}{% endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=-1) %}
{%- for message in messages[::-1] %}
{%- set index = (messages | length - 1) - loop.index0 %}
{%- if ns.multi_step_tool and message.role == 'user' %}
{%- set text = render_content(message.content) | trim %}
{%- if not (text.startswith('<tool_response>') and text.endswith('</tool_response>')) %}
{%- set ns.multi_step_tool = false %}
{%- set ns.last_query_index = index %}
{%- endif %}
{%- endif %}
{%- endfor %}
{%- if ns.multi_step_tool %}{{ raise_exception('No user query found in messages.') }}{% endif %}
{%- if tools %}
{{- '<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>' }}
{%- for tool in tools %}
{{- '\n' }}{{- tool | tojson }}
{%- endfor %}
{{- '\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>' }}
{%- if messages[0].role == 'system' %}
{{- '\n\n' + render_content(messages[0].content) | trim }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + render_content(messages[0].content) | trim + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- set content = render_content(message.content) | trim %}
{%- if message.role == 'system' %}
{%- if not loop.first %}{{ raise_exception('System message must be at the beginning.') }}{% endif %}
{%- elif message.role == 'user' %}
{{- '<|im_start|>user\n' + content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{%- set reasoning = '' %}
{%- if message.reasoning_content is string %}
{%- set reasoning = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning = content.split('</think>')[0].split('<think>')[-1] %}
{%- set content = content.split('</think>')[-1] %}
{%- endif %}
{%- set reasoning = reasoning | trim %}
{%- set content = content | trim %}
{%- if loop.index0 > ns.last_query_index %}
{{- '<|im_start|>assistant\n<think>\n' + reasoning + '\n</think>\n\n' + content }}
{%- else %}
{{- '<|im_start|>assistant\n' + content }}
{%- endif %}
{%- if message.tool_calls %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{%- if not loop.first or content %}{{- '\n\n' }}{%- endif %}
{{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}
{%- if tool_call.arguments is mapping %}
{%- for arg_name, arg_value in tool_call.arguments | items %}
{{- '<parameter=' + arg_name + '>\n' }}
{%- if arg_value is mapping or (arg_value is iterable and arg_value is not string) %}{{- arg_value | tojson }}{%- else %}{{- arg_value | string }}{%- endif %}
{{- '\n</parameter>\n' }}
{%- endfor %}
{%- endif %}
{{- '</function>\n</tool_call>' }}
{%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
{%- else %}
{{- raise_exception('Unexpected message role.') }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\n\n</think>\n\n' }}
{%- else %}
{{- '<think>\n' }}
{%- endif %}
{%- endif %}
""".strip()
