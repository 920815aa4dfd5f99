"""How a question's evidence is chosen: the document's structure (`structure`), its code definitions
(`code_units`), named sections such as a filing's statements (`named_sections`), the conversation
and the question's own words, combined into one ranked list of spans (`select`)."""
