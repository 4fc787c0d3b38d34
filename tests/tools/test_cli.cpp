// placeholder (helper writes it)
