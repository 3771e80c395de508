"""The bundled skills (each folder: ``SKILL.md`` + code), shipped inside the distribution as
``jobs.bundled_skills`` so that an installed wheel has them."""
